#!/bin/bash
echo lower > /app/out.txt
