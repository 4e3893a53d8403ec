//! A system read and its frames checked: what every reader but the training set's parallel one
//! wants (that one reads with `read_system_in` and checks the frames itself).

use std::path::Path;

use super::error::DataError;
use super::files::{Disk, Files};
use super::system::{read_system_in, Labels, System};
use super::validate::check_frames;

/// Load the system at `path` (a folder, or `file.hdf5#/group`), mapping its atom types onto the
/// model's `type_map`.
pub fn load_system(path: &Path, type_map: &[String]) -> Result<System, DataError> {
    load_system_in(&Disk, path, type_map)
}

/// [`load_system`] with the frame label `labels` asks for ([`Labels::Frame`]).
pub fn load_system_with(
    path: &Path,
    type_map: &[String],
    labels: &Labels,
) -> Result<System, DataError> {
    let sys = read_system_in(&Disk, path, type_map, labels)?;
    check_frames(&sys)?;
    Ok(sys)
}

/// [`load_system`] from the files of `fs`.
pub fn load_system_in(
    fs: &dyn Files,
    path: &Path,
    type_map: &[String],
) -> Result<System, DataError> {
    let sys = read_system_in(fs, path, type_map, &Labels::Optional)?;
    check_frames(&sys)?;
    Ok(sys)
}
