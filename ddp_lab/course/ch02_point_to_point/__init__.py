"""Notebook 02: send/recv, isend/irecv, the ring, the send-send deadlock, ping-pong."""
