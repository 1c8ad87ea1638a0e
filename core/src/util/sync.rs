//! Locks that outlive a panicking holder. A client thread that panicked
//! while holding one of the engine's mutexes leaves the state as it was
//! at the panic; the others go on with it (and meet whatever error the
//! state leads to) rather than panic in turn.

use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Duration;

/// Locks `m`; if a holder panicked, takes the lock anyway and returns the
/// state as the panic left it instead of propagating the poison.
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

/// `Condvar::wait` on `c`, releasing and re-taking `g`; ignores poison as
/// [`lock`] does. Spurious wake-ups happen: callers re-check their condition.
pub fn wait<'a, T>(c: &Condvar, g: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
    match c.wait(g) {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

/// [`wait`], for at most `d` (the guard comes back either way).
pub fn wait_timeout<'a, T>(c: &Condvar, g: MutexGuard<'a, T>, d: Duration) -> MutexGuard<'a, T> {
    match c.wait_timeout(g, d) {
        Ok((g, _)) => g,
        Err(p) => p.into_inner().0,
    }
}
