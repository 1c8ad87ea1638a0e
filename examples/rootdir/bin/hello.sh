#!/bin/sh
echo "hello from a btrkit image"
