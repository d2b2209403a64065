#!/bin/bash
echo UPPER > /app/out.txt
