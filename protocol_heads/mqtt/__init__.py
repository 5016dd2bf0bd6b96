"""MQTT head: a sans-IO codec and connection state machine under a thin asyncio adapter."""
