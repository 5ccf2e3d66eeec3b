// Validates ServiceMonitors (a JSON array on stdin) against the Prometheus Operator's CRD
// schema as compiled by @kubernetes-models/prometheus-operator. Usage:
//   node validate_servicemonitors.mjs NODE_MODULES_DIR < monitors.json
// Prints "ok NAME" or "invalid NAME: reasons" per object; exits 1 when any is invalid.
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { pathToFileURL } from "node:url";

const modules = process.argv[2];
const model = join(
  modules,
  "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1/ServiceMonitor.js",
);
const { ServiceMonitor } = await import(pathToFileURL(model).href);
const monitors = JSON.parse(readFileSync(0, "utf8"));
let invalid = 0;
for (const monitor of monitors) {
  const name = `${monitor.metadata?.namespace ?? ""}/${monitor.metadata?.name ?? "?"}`;
  try {
    new ServiceMonitor(monitor).validate();
    console.log(`ok ${name}`);
  } catch (error) {
    invalid += 1;
    console.log(`invalid ${name}: ${error.message.replaceAll("\n", "; ")}`);
  }
}
process.exit(invalid ? 1 : 0);
