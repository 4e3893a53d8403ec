//! A message-passing block's forward state kept from one pass to the next on the same inputs.
//!
//! A training step runs the block four times: the forward (D), the backward (q = ∂E/∂r_ij),
//! the tangent (Ḋ) and the dual reverse (the parameter gradient). The backward needs the
//! forward's state and the dual reverse the tangent's; each pass used to build it again. The
//! stage holds a [`Keep`]: a pass that builds a state leaves it there with the inputs it was
//! built from, and the next pass takes it when its own inputs are those, bit for bit, and builds
//! it again otherwise, so a caller that runs a backward alone still gets the right answer.

use std::any::Any;
use std::sync::Mutex;

#[derive(Default)]
pub struct Keep(Mutex<Option<Box<dyn Any + Send>>>);

impl Keep {
    /// Leaves `state`, built from `key`, for the next pass (dropping what was kept before).
    pub fn put<K: Send + 'static, S: Send + 'static>(&self, key: K, state: S) {
        *self.slot() = Some(Box::new((key, state)));
    }

    /// The state kept from inputs equal to `key`, if that is what is kept; the slot is empty
    /// after, either way.
    pub fn take<K: PartialEq + Send + 'static, S: Send + 'static>(&self, key: &K) -> Option<S> {
        let kept = self.slot().take()?;
        match kept.downcast::<(K, S)>() {
            Ok(b) if b.0 == *key => Some(b.1),
            _ => None,
        }
    }

    fn slot(&self) -> std::sync::MutexGuard<'_, Option<Box<dyn Any + Send>>> {
        // A pass that panicked left nothing half-written here: the slot is replaced whole.
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The inputs a block's state is built from: its constants, the centres' types and every array
/// the passes read (the tangent ṙ_ij too where there is one), compared whole.
#[derive(PartialEq)]
pub struct Key<T, O> {
    opts: O,
    centre_types: Vec<usize>,
    vals: Vec<Vec<T>>,
    idx: Vec<Vec<i32>>,
}

impl<T: Copy, O> Key<T, O> {
    pub fn new(opts: O, centre_types: Vec<usize>, vals: &[&[T]], idx: &[&[i32]]) -> Self {
        Key {
            opts,
            centre_types,
            vals: vals.iter().map(|v| v.to_vec()).collect(),
            idx: idx.iter().map(|v| v.to_vec()).collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Keep, Key};

    fn key(params: &[f64], rij: &[f64]) -> Key<f64, u8> {
        Key::new(0, vec![0, 1], &[params, rij], &[&[0, -1]])
    }

    #[test]
    fn a_state_is_taken_once_and_only_for_its_own_inputs() {
        let keep = Keep::default();
        keep.put(key(&[1.0, 2.0], &[0.5]), vec![7.0f64]);
        assert_eq!(
            keep.take::<_, Vec<f64>>(&key(&[1.0, 2.0], &[0.5])),
            Some(vec![7.0])
        );
        assert_eq!(keep.take::<_, Vec<f64>>(&key(&[1.0, 2.0], &[0.5])), None);
        // A changed parameter (the next step's), or the same values split otherwise: rebuilt,
        // and what was kept is gone.
        for other in [key(&[1.0, 2.5], &[0.5]), key(&[1.0], &[2.0, 0.5])] {
            keep.put(key(&[1.0, 2.0], &[0.5]), vec![7.0f64]);
            assert_eq!(keep.take::<_, Vec<f64>>(&other), None);
            assert_eq!(keep.take::<_, Vec<f64>>(&key(&[1.0, 2.0], &[0.5])), None);
        }
        // A state of another kind (the tangent's duals where the reals are asked for).
        keep.put(key(&[1.0], &[]), vec![7.0f32]);
        assert_eq!(keep.take::<_, Vec<f64>>(&key(&[1.0], &[])), None);
    }
}
