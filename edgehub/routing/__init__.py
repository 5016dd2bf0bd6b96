"""edgehub.routing."""
