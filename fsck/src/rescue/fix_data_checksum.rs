//! `rescue fix-data-checksum`: bad data copies rewritten from good ones.

use crate::cli::Common;
use btrkit_core::rescue::fix_data_checksum::{fix_data_checksum, Options};

pub fn run(common: &Common, readonly: bool, mirror: Option<usize>) -> anyhow::Result<i32> {
    let r = fix_data_checksum(&common.images, Options { readonly, mirror })?;
    super::show(common, "fix-data-checksum", &r)
}
