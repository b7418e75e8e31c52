// Package startup is what the three commands do alike before they run, as upstream's cmd/*/app each do on
// their own: an optional configuration file under the flags given on the command line, the feature gates,
// validation and logging.
package startup

import (
	"fmt"
	"path/filepath"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/util/validation/field"
	logsapi "k8s.io/component-base/logs/api/v1"

	logf "github.com/cert-manager/cert-manager/pkg/logs"
	"github.com/cert-manager/cert-manager/pkg/util/configfile"
	utilfeature "github.com/cert-manager/cert-manager/pkg/util/feature"
)

// Configuration is one command's configuration, seen through what its start-up needs.
type Configuration struct {
	File     configfile.ConfigFile         // the command's file type (`New()` of its configfile package)
	Apply    func()                        // copies File's configuration over the command's
	Gates    func() map[string]bool        // the configuration's feature gates, read when they are set
	Validate func() field.ErrorList        // the command's validation of its configuration
	Logging  *logsapi.LoggingConfiguration // the configuration's logging
}

// PreRun fills the configuration before the command runs: the file at path, if any, then the flags given
// in args again, so that a flag on the command line wins over the file; then the feature gates,
// validation and logging.
func (c Configuration) PreRun(cmd *cobra.Command, args []string, path string) error {
	setGates := func() error { return utilfeature.DefaultMutableFeatureGate.SetFromMap(c.Gates()) }
	if err := setGates(); err != nil {
		return err
	}
	if path != "" {
		abs, err := filepath.Abs(path)
		if err != nil {
			return err
		}
		loader, err := configfile.NewConfigurationFSLoader(nil, abs)
		if err != nil {
			return fmt.Errorf("config file %s: %w", abs, err)
		}
		if err := loader.Load(c.File); err != nil {
			return fmt.Errorf("config file %s: %w", abs, err)
		}
		c.Apply()
		if err := cmd.ParseFlags(args); err != nil {
			return err
		}
		if err := setGates(); err != nil {
			return err
		}
	}
	if errs := c.Validate(); len(errs) > 0 {
		return fmt.Errorf("invalid flags: %w", errs.ToAggregate())
	}
	return logf.ValidateAndApply(c.Logging)
}
