"""Protocol heads: MQTT and AMQP. They see only edgehub.hub and edgehub.core.

What both heads share has one home here: ``limits`` (``HeadSettings``, ``connection_cap``), ``listeners``
(``HeadServer``: listeners, admission, login throttles, client tasks), ``socket_side`` (``SocketSide``: admission
at accept, the TLS start, pacing, flushing, refusal lines, the connection's task; ``SessionSocket``, what a session
may ask of it) and ``tls`` (the client certificate). Each head subclasses them with its protocol's own, and maps
the refusals of a message (``edgehub.core.refusals.MESSAGE_REFUSALS``) to its protocol's words in its own
``refusals`` table.
"""
