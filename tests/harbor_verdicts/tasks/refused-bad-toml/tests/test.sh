#!/bin/bash
mkdir -p /logs/verifier
echo 0 > /logs/verifier/reward.txt
