//! Normalisation (being written).
