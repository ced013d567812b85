#!/usr/bin/env node
// A task kind in Node.js (no packages) that refuses a payload it cannot use.
// Shows a result, and a discard: a task without payload.name fails at once, with no
// retry, since no retry could make it succeed (docs/programs.md).
//
// Kind `greet` (the file name without `.js`). With this folder as the tasks folder:
//   artex worker --tasks-dir examples/programs
//   artex submit greet --payload '{"name": "Ada"}' --wait
//   artex submit greet --wait          # failed: "discarded: payload.name is missing"
// By hand, fd 3 shown on the terminal:
//   echo '{"payload": {"name": "Ada"}}' | examples/programs/greet.js 3>&1

'use strict';

const fs = require('fs');

// The task: one JSON object on standard input (file descriptor 0), then end of file.
const task = JSON.parse(fs.readFileSync(0, 'utf8'));
const payload = task.payload || {};

// A discard fails the task with no retry; it is the outcome whatever the exit status,
// so the program exits 0 all the same.
const line = payload.name === undefined || payload.name === null
  ? { discard: 'payload.name is missing' }
  : { result: { greeting: 'hello, ' + payload.name } };

// writeSync writes the whole line before it returns: nothing is left in a buffer when
// the program exits.
fs.writeSync(3, JSON.stringify(line) + '\n');
