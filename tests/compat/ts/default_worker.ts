// A Worker with every option at its default: it must report no error against shardq.
import { Queue, Worker } from "bunqueue/client";
import { connection, queueName, report, until } from "./_common";

const name = queueName("default");
const queue = new Queue(name, { connection });
await queue.add("one", { a: 1 });
const errors: string[] = [];
const done: string[] = [];
const worker = new Worker(name, async (j) => { done.push(j.id); }, { connection });
worker.on("error", (err) => errors.push(String(err)));
await until(() => done.length === 1, 15_000);
// Long enough for the event subscription made at start to have been answered.
await new Promise((r) => setTimeout(r, 500));
await worker.close();
report({ processed: done.length, errors });
