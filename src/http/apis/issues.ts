// A zod validation failure as the router's tagged body failure: one wording for every dialect
// (http/body.ts issueFailure). Pure.

export { issueFailure as firstIssue } from '../body.js';
