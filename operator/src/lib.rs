//! rocefabric operator library.
