"""PySpark end-of-day settlement: pure DataFrame steps (``transforms``) and the session
factory (``session``).

Kept free of imports so that ``import settlement.spark`` stays cheap; pyspark is loaded
only by the submodules that need it.
"""
