"""Protocol heads: MQTT and AMQP. They see only edgehub.hub and edgehub.core."""
