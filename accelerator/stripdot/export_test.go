package stripdot

// KernelNames lists the kernels this CPU runs, fastest first, so that the
// plugin tests run the handler of each.
func KernelNames() []string {
	var names []string
	for _, kn := range kernels() {
		names = append(names, kn.String())
	}
	return names
}

// RegisterKernel registers the handler running the kernel named name as
// target: a process registers one handler per target name, so a kernel
// other than Kernel's needs a name of its own.
func RegisterKernel(pluginPath, target, name string) error {
	for _, kn := range kernels() {
		if kn.String() == name {
			return registerAs(pluginPath, target, kn)
		}
	}
	return check(kernelNone)
}
