// mkernel — the configs users already have, read as a workload (docs/planner.md, "Importing configs"): a Hugging
// Face config.json becomes the model shape; a Megatron-LM / NeMo argument list or YAML recipe becomes model,
// training and layout.
// A key or argument that changes the step but that the workload cannot express is an error naming it; one that
// does not change the step (rope_theta, --lr, ...) is read and listed in `ignored`.
#pragma once

#include <string>
#include <vector>

#include "mk/workload/workload.hpp"

namespace mk {

/// Replace `w.model` with the model of the Hugging Face config.json `text` (`where` names the file in errors).
/// Appends the keys read and left aside to `ignored`. Throws Error(ParseError) naming the key for a malformed,
/// unknown or inexpressible key ("config.json: mlp_only_layers: ..."), Error(InvalidArgument) from
/// validateWorkload.
void applyHfConfig(Workload& w, const std::string& text, const std::string& where, std::vector<std::string>& ignored);

/// Apply a Megatron-LM / NeMo argument list (`text`: arguments separated by white space or new lines, "#"
/// comments and "\" line continuations allowed; `--key value` or `--key=value`). The layout and training start
/// from Megatron-LM's defaults (no sequence parallelism, no distributed optimizer, tied embeddings, GeLU); model
/// arguments override `w.model`. Throws Error(ParseError) naming the argument for an unknown, malformed or
/// inexpressible argument, Error(InvalidArgument) from validateWorkload.
void applyMegatronArgs(Workload& w, const std::string& text, const std::string& where,
                       std::vector<std::string>& ignored);

/// Apply a YAML training recipe (`text`): a Megatron-LM --yaml-cfg file (argument names with underscores, at the
/// top level or under `language_model:` / `model_parallel:`) or a NeMo 1.x recipe (a `model:` map with NeMo's names,
/// `trainer.precision`). The recipe is renamed into the argument list applyMegatronArgs reads; errors and the
/// `ignored` list name the YAML path ("recipe.yaml: model.foo_bar: unknown key ..."). Throws Error(ParseError) for
/// malformed YAML or an unknown, malformed or inexpressible key, Error(InvalidArgument) from validateWorkload.
void applyRecipe(Workload& w, const std::string& text, const std::string& where, std::vector<std::string>& ignored);

}  // namespace mk
