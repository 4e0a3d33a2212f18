"""The transfer clause: batch tensors arrive through shared memory."""
