// Shared by the scripts: the server's address from the environment, and a bounded wait.
export const connection = { host: "127.0.0.1", port: Number(process.env.SHARDQ_PORT) };
export const queueName = (suffix: string) => `${process.env.SHARDQ_QUEUE ?? "ts"}-${suffix}`;

export async function until(cond: () => boolean, ms: number): Promise<boolean> {
  const deadline = Date.now() + ms;
  while (!cond()) {
    if (Date.now() > deadline) return false;
    await new Promise((r) => setTimeout(r, 20));
  }
  return true;
}

// The one line the pytest side reads: everything the script observed, as JSON.
export function report(result: Record<string, unknown>): never {
  console.log("RESULT " + JSON.stringify(result));
  process.exit(0);
}
