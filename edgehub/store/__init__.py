"""edgehub.store."""
