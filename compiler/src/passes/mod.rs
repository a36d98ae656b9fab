//! The passes of the pipeline, one file each (each opens with its algorithm note), and the
//! ordered list of named stages that `compile` runs and `aubier gen --dump-after` names.

pub mod cse;
pub mod dce;

use crate::error::CompileError;
use crate::ir::Graph;

/// A named rewrite of the graph. `run` returns how many nodes it changed or removed.
#[derive(Clone, Copy, Debug)]
pub struct Pass {
    /// Stage name (`cse`, `dce`), as `--dump-after` takes it.
    pub name: &'static str,
    /// The rewrite.
    pub run: fn(&mut Graph) -> Result<usize, CompileError>,
}

/// The passes after `build`, in pipeline order: CSE first (merging can leave nodes dead), then
/// DCE.
pub const PASSES: &[Pass] = &[
    Pass {
        name: "cse",
        run: cse::run,
    },
    Pass {
        name: "dce",
        run: dce::run,
    },
];
