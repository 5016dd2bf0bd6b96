"""edgehub.runtime."""
