"""The leaks clause: nothing the loader started outlives an epoch's end; fds and shared memory stay flat."""
