"""qbatch: distributed large-batch quantile Bayesian optimization, and its adapters to Ray Tune, Optuna and gest-api."""
