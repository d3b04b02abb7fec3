"""Transports: HTTP (server app and client) and an in-process one for tests.

A client transport has one method, `request(op, header, vector)`, returning the reply
header and the reply vector (if any); see `asyncsync.transport.base.Transport`.
"""
