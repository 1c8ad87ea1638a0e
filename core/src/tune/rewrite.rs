//! Tree blocks rewritten in place.
