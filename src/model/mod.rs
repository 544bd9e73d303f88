//! Jobs, schedules and runs: plain data and pure logic, no I/O.

pub mod job;
pub mod records;
pub mod schedule;
pub mod validate;
