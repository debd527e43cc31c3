//! Checkpoints: consistent images of all operator state, persisted to an object store with only
//! new SST files uploaded (see `docs/design/0003-checkpoints.md`).
//!
//! `ledger` holds the decisions, free of I/O: which files a checkpoint uploads and which it
//! reuses, how many retained checkpoints name each object, and what the expiry of old
//! checkpoints deletes.

pub mod ledger;
