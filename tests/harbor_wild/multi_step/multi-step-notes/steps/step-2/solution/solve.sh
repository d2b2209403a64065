#!/bin/bash

# Use this file to solve the task.
echo "step two done" >> /app/notes.txt
