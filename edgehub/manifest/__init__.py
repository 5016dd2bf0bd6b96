"""edgehub.manifest."""
