//! Helpers shared by several integration tests (each test file that uses
//! them declares `mod support;`).

pub mod plan_cases;
