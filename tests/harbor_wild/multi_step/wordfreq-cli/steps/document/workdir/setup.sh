#!/bin/bash
# Runs from the working directory before the step starts (Harbor's per-step setup).
mkdir -p /app/docs
