"""The cloud side: a PySpark job that turns the landing zone into tables, and the landing receiver."""
