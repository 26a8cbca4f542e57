package fleet

// Environment variables of the suite.
const (
	SeedEnv   = "FLEET_SEED"   // the seed of the fault schedule and workloads (bounded run: 1; soak: random, printed)
	SoakEnv   = "FLEET_SOAK"   // run the soak for this long (e.g. 10m); unset: the soak is skipped
	ReportEnv = "FLEET_REPORT" // also write the final table to this file
)
