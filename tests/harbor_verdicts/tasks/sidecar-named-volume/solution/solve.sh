#!/bin/bash
cp /shared/token /app/answer.txt
