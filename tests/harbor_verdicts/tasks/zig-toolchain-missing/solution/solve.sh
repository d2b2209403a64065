#!/bin/bash
cd /app
zig build-exe hello.zig -femit-bin=/app/hello
