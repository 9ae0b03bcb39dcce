//! Placeholder: element-wise reductions.
