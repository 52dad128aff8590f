//! Losses (being written).
