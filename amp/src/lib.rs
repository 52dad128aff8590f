//! brasa-amp (being written).
