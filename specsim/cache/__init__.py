"""The HDF5 cache: format, writer, reader and derived features (numpy only)."""
