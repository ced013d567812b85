#!/bin/sh
# A task kind in POSIX sh, with no JSON tool: it returns the whole task it was given.
# Shows reading the task from standard input and writing protocol lines to file
# descriptor 3 (docs/programs.md).
#
# Kind `echo-input` (the file name without `.sh`). With this folder as the tasks folder:
#   artex worker --tasks-dir examples/programs
#   artex submit echo-input --payload '{"text": "hello"}' --wait
# By hand, fd 3 shown on the terminal:
#   echo '{"payload": {"text": "hello"}}' | examples/programs/echo-input.sh 3>&1

set -eu

# The task is one JSON object on one line; $(...) drops the newline after it.
input=$(cat)

echo "read $(printf '%s' "$input" | wc -c) bytes of task" >&2   # to the worker's log

printf '{"progress": 0.5, "message": "read the task"}\n' >&3
# %s copies the object as it is: it is JSON already, so the line is JSON.
printf '{"result": %s}\n' "$input" >&3
