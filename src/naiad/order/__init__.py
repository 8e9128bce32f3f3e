"""The order maths both pipelines share: rank ranges, batch sizes, and an epoch's legs on
more than one topology (elastic resume)."""
