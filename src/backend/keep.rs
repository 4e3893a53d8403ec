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

use bytemuck::Pod;

/// A stage's state from one pass to the next, and what a device keeps for its passes from step
/// to step (the buffers of its tape's runs), which goes with the stage rather than living as
/// long as the device.
#[derive(Default)]
pub struct Keep {
    state: Mutex<Option<Box<dyn Any + Send>>>,
    resources: Mutex<Option<Box<dyn Any + Send>>>,
}

impl Keep {
    /// The device's resources for this stage, made on first use (a handle shared with the
    /// runs that use them); a device of another kind replaces them.
    pub fn resources<P: Default + Clone + Send + 'static>(&self) -> P {
        let mut slot = (self.resources.lock()).unwrap_or_else(|e| e.into_inner());
        match slot.as_ref().and_then(|r| r.downcast_ref::<P>()) {
            Some(p) => p.clone(),
            None => {
                let p = P::default();
                *slot = Some(Box::new(p.clone()));
                p
            }
        }
    }

    /// Leaves `state`, built from `key`, for the next pass (dropping what was kept before).
    pub fn put<K: Send + 'static, S: Send + 'static>(&self, key: K, state: S) {
        *self.slot() = Some(Box::new((key, state)));
    }

    /// The state kept, if it is an S whose key `is_mine`; the slot is empty after, either way.
    pub fn take<K: Send + 'static, S: Send + 'static>(
        &self,
        is_mine: impl FnOnce(&K) -> bool,
    ) -> Option<S> {
        let kept = self.slot().take()?;
        match kept.downcast::<(K, S)>() {
            Ok(b) if is_mine(&b.0) => Some(b.1),
            _ => None,
        }
    }

    fn slot(&self) -> std::sync::MutexGuard<'_, Option<Box<dyn Any + Send>>> {
        // A pass that panicked left nothing half-written here: the slot is replaced whole.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The inputs a block's state is built from: its constants, the centres' types and every array
/// the passes read (the tangent ṙ_ij too where there is one), compared whole, bit for bit.
pub struct Key<T, O> {
    opts: O,
    centre_types: Vec<usize>,
    vals: Vec<Vec<T>>,
    idx: Vec<Vec<i32>>,
}

impl<T: Pod, O: PartialEq> Key<T, O> {
    pub fn new(opts: O, centre_types: Vec<usize>, vals: &[&[T]], idx: &[&[i32]]) -> Self {
        Key {
            opts,
            centre_types,
            vals: vals.iter().map(|v| v.to_vec()).collect(),
            idx: idx.iter().map(|v| v.to_vec()).collect(),
        }
    }

    /// Whether these are the inputs the key was made of, compared where they are (no copy).
    pub fn is(&self, opts: &O, centre_types: &[usize], vals: &[&[T]], idx: &[&[i32]]) -> bool {
        fn same<V: Pod>(mine: &[Vec<V>], theirs: &[&[V]]) -> bool {
            mine.len() == theirs.len()
                && (mine.iter().zip(theirs)).all(|(a, b)| {
                    bytemuck::cast_slice::<V, u8>(a) == bytemuck::cast_slice::<V, u8>(b)
                })
        }
        self.opts == *opts
            && self.centre_types == centre_types
            && same(&self.vals, vals)
            && same(&self.idx, idx)
    }
}

#[cfg(test)]
mod tests {
    use super::{Keep, Key};

    fn key(params: &[f64], rij: &[f64]) -> Key<f64, u8> {
        Key::new(0, vec![0, 1], &[params, rij], &[&[0, -1]])
    }

    /// The state kept if it was built from `params` and `rij`.
    fn take<S: Send + 'static>(keep: &Keep, params: &[f64], rij: &[f64]) -> Option<S> {
        keep.take(|k: &Key<f64, u8>| k.is(&0, &[0, 1], &[params, rij], &[&[0, -1]]))
    }

    #[test]
    fn a_state_is_taken_once_and_only_for_its_own_inputs() {
        let keep = Keep::default();
        keep.put(key(&[1.0, 2.0], &[0.5]), vec![7.0f64]);
        assert_eq!(
            take::<Vec<f64>>(&keep, &[1.0, 2.0], &[0.5]),
            Some(vec![7.0])
        );
        assert_eq!(take::<Vec<f64>>(&keep, &[1.0, 2.0], &[0.5]), None);
        // A changed parameter (the next step's), the same values split otherwise, or a zero of
        // the other sign (equal as numbers, not bit for bit): rebuilt, and what was kept is gone.
        let others: [(&[f64], &[f64]); 3] = [
            (&[1.0, 2.5], &[0.5]),
            (&[1.0], &[2.0, 0.5]),
            (&[1.0, 2.0], &[-0.0]),
        ];
        for (params, rij) in others {
            keep.put(key(&[1.0, 2.0], &[0.0]), vec![7.0f64]);
            assert_eq!(take::<Vec<f64>>(&keep, params, rij), None);
            assert_eq!(take::<Vec<f64>>(&keep, &[1.0, 2.0], &[0.0]), None);
        }
        // A state of another kind (the tangent's duals where the reals are asked for).
        keep.put(key(&[1.0], &[]), vec![7.0f32]);
        assert_eq!(take::<Vec<f64>>(&keep, &[1.0], &[]), None);
    }

    #[test]
    fn resources_are_made_once_and_outlive_the_states() {
        use std::sync::{Arc, Mutex};
        type Pool = Arc<Mutex<Vec<u8>>>;
        let keep = Keep::default();
        keep.resources::<Pool>().lock().unwrap().push(3);
        keep.put(key(&[1.0], &[]), vec![7.0f64]);
        assert_eq!(take::<Vec<f64>>(&keep, &[1.0], &[]), Some(vec![7.0]));
        assert_eq!(*keep.resources::<Pool>().lock().unwrap(), vec![3]);
        // Another device's kind of resources replaces them.
        assert_eq!(
            keep.resources::<Arc<Mutex<u32>>>()
                .lock()
                .map(|v| *v)
                .unwrap(),
            0
        );
        assert!(keep.resources::<Pool>().lock().unwrap().is_empty());
    }
}
