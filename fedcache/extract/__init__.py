"""Datasets, backbones and the extraction runner (the Python API's ``fedcache.extract_features``)."""
