"""End of day: the source model, the source chooser and the pipeline that runs a day."""
