// Command harmonia-ci is a distributed Nix CI in one binary; see the README.
package main

import (
	"os"

	"github.com/harmonia-ci/harmonia-ci/internal/cli"
)

func main() { os.Exit(cli.Execute()) }
