#!/bin/bash

# Use this file to solve the task.
echo "step one done" > /app/notes.txt
