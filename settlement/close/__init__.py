"""The close of a trade date, conducted: take the date's lease (or join), choose the source
once, read once, settle, validate in hand, publish (fenced), write the instructions and the
report; and the re-close of a day amended after its close.

It sits above validation, report and instructions, which it calls; the ``eod`` package below
keeps the source model, the sources and the lease, which everything above may use.
"""
