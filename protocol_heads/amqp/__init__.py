"""AMQP 1.0 head (python-qpid-proton engine under our asyncio loop). Not built yet."""
