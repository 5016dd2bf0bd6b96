"""edgehub.upstream."""
