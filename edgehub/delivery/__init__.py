"""edgehub.delivery."""
