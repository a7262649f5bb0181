// Package flagenv gives every command-line flag an environment twin: a
// flag not given on the command line takes its value from the variable
// named by Name, so a deployment can configure recmesh without flags.
package flagenv

import (
	"flag"
	"fmt"
	"strings"
)

// Prefix starts the name of every recmesh environment variable.
const Prefix = "RECMESH_"

// Name returns the environment twin of a flag: Prefix, then the flag name
// upper-cased with dashes as underscores (max-vocab → RECMESH_MAX_VOCAB).
func Name(flagName string) string {
	return Prefix + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// PrintConfigFlag is the flag DefinePrintConfig adds.
const PrintConfigFlag = "print-config"

// DefinePrintConfig adds -print-config to fs: Apply then prints every
// flag's value as the command would use it (command line, then environment
// twins, then defaults) and returns flag.ErrHelp, so the command exits as
// it does after -h. Operators see the effective configuration; tests check
// that each variable reaches its flag.
func DefinePrintConfig(fs *flag.FlagSet) {
	fs.Bool(PrintConfigFlag, false, "print every flag's value after the environment twins, then exit")
}

// Apply sets each flag of fs that the command line (already parsed into fs)
// did not set from its environment twin, read with getenv. An empty
// variable counts as unset. A value the flag refuses is an error naming
// the variable and the flag.
func Apply(fs *flag.FlagSet, getenv func(string) string) error {
	given := make(map[string]bool)
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		if err != nil || given[f.Name] || f.Name == PrintConfigFlag {
			return
		}
		env := Name(f.Name)
		v := getenv(env)
		if v == "" {
			return
		}
		if e := fs.Set(f.Name, v); e != nil {
			err = fmt.Errorf("invalid value %q for %s (flag -%s): %v", v, env, f.Name, e)
		}
	})
	if err != nil {
		return err
	}
	if f := fs.Lookup(PrintConfigFlag); f != nil && f.Value.String() == "true" {
		PrintConfig(fs)
		return flag.ErrHelp
	}
	return nil
}

// PrintConfig writes one line per flag of fs to its output:
// "-name=value (ENV)".
func PrintConfig(fs *flag.FlagSet) {
	w := fs.Output()
	fs.VisitAll(func(f *flag.Flag) {
		if f.Name != PrintConfigFlag {
			fmt.Fprintf(w, "-%s=%s (%s)\n", f.Name, f.Value.String(), Name(f.Name))
		}
	})
}

// Usage prints fs's flags like flag.PrintDefaults, each followed by its
// environment twin.
func Usage(fs *flag.FlagSet) {
	w := fs.Output()
	fs.VisitAll(func(f *flag.Flag) {
		if f.Name == PrintConfigFlag {
			fmt.Fprintf(w, "  -%s\n    \t%s\n", f.Name, f.Usage)
			return
		}
		name, usage := flag.UnquoteUsage(f)
		line := "  -" + f.Name
		if name != "" {
			line += " " + name
		}
		fmt.Fprintf(w, "%s\n    \t%s", line, strings.ReplaceAll(usage, "\n", "\n    \t"))
		if f.DefValue != "" {
			// Quote string defaults only, as flag.PrintDefaults does.
			quote := false
			if g, ok := f.Value.(flag.Getter); ok {
				_, quote = g.Get().(string)
			}
			if quote {
				fmt.Fprintf(w, " (default %q)", f.DefValue)
			} else {
				fmt.Fprintf(w, " (default %s)", f.DefValue)
			}
		}
		fmt.Fprintf(w, "\n    \tenvironment: %s\n", Name(f.Name))
	})
}
