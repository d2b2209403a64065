#!/bin/bash

# Use this file to solve the task.
wc -w < /app/poem.txt > /app/count.txt
