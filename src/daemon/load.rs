//! The configuration, checked whole before anything starts: the config's own checks,
//! then what only the rooms below can tell (the store: which engine a data directory
//! holds, a memory limit on it, the PostgreSQL URL's parameters; shaping: whether the
//! jq programs compile). Every problem is reported at once, each naming its key.

use std::collections::HashMap;
use std::path::Path;

use crate::config::{Config, ConfigError, EnvLookup};

/// The configuration `hookrelay serve` and `check-config` run on.
pub(crate) fn config(path: &Path, env: &HashMap<String, String>) -> Result<Config, ConfigError> {
    Config::load_checking(path, env, |config, env| {
        let mut problems = config.validate(env).err().unwrap_or_default();
        problems.extend(crate::store::settle(&mut config.storage));
        problems.extend(crate::shape::check(&config.destinations));
        checked(problems)
    })
}

/// The storage settings alone, settled: what `hookrelay migrate` needs (no token nor
/// secret of the sources, destinations and admin API).
pub(crate) fn storage(path: &Path, env: &HashMap<String, String>) -> Result<Config, ConfigError> {
    Config::load_checking(path, env, |config, env: EnvLookup<'_>| {
        let mut problems = config.validate_storage_only(env).err().unwrap_or_default();
        problems.extend(crate::store::settle(&mut config.storage));
        checked(problems)
    })
}

/// `problems`, as the config's checks return them.
fn checked(problems: Vec<String>) -> Result<(), Vec<String>> {
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems)
    }
}
