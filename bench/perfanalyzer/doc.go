// Package perfanalyzer holds what `make perf-analyzer` gives Triton's load
// generator: inputs.json, perf_analyzer's input-data file of valid random
// requests for the dev bundle (data/dlrm-cap1000), and run.sh, which starts
// the mesh, runs perf_analyzer against it and prints the acceptance line.
// The test beside it regenerates inputs.json from model.RandomInputs, so
// the file can only change with the model's input stream.
package perfanalyzer
